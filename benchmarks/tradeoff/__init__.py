"""When does k2 > k1 pay? Validation quality against training time under each truncation, on real tasks.

``python -m benchmarks.tradeoff [--quick] [--tasks ...]``. Every run trains a task's model with
``create_tbptt_trainer(..., carry_hidden=True)``, Adam and gradient clipping at norm 1 (as the main job), for a
fixed budget of training seconds on one core, and evaluates on held-out data six times along the way; the
truncations (:mod:`benchmarks.tradeoff.truncations`) and tasks (:mod:`benchmarks.tradeoff.tasks`) are listed
there. Each truncation gets its learning rate from the task's grid of three by one rule (the lowest validation
loss at the budget with seed 0), then three fresh seeds at that rate, which the page reports
(:mod:`benchmarks.tradeoff.study`). The
page and figures are drawn from the results file alone (:mod:`benchmarks.tradeoff.report`).
"""

INTRO = """\
Each run trains one task's model under one truncation for a fixed budget of training seconds (evaluation is
not counted), with Adam and gradient clipping at norm 1, `carry_hidden=True`, two runs at once on the two
cores, one thread each. Its learning rate is chosen per truncation from the task's grid of three: the one whose
seed-0 run ends lowest on the validation data (each task's grid table follows its findings). Fresh seeds then
run at that rate, and only they are reported: seed 0, the lowest of three, would favour the truncations
whose results vary most. The tables give the validation loss at the budget (the mean of the seeds, their range
in brackets), optimizer steps and training targets per second (means), and the largest rise of resident memory
over the process ready to train (MiB, sampled every millisecond; it includes one-off allocations of the first
steps). The curves are the seeds' means; the first evaluations of the slower truncations lie above the plots,
whose height is set by the lowest nine tenths of the points. A difference is called clear only when the seeds'
ranges do not overlap.

The truncations, from each task's five window lengths `a < b < c < d < e`: TBPTT(k, k) at each length;
k2 > k1 at the same k2 (TBPTT(a, c) and TBPTT(b, c) beside TBPTT(c, c), TBPTT(b, d) and TBPTT(c, d) beside
TBPTT(d, d)); `RandomWindows(c, c)` (AWD-LSTM's lengths, mean about c); `ARTBP(grid=b, mean_length=c)`
(unbiased); `AdaptiveTruncation` with windows of b and k2 in (b, e], bias under 10%. Interpretation and advice:
[Choosing k1 and k2](concepts.md#choosing-k1-and-k2). The other regime, where the data arrives once, closes the
page.
"""

ONLINE_INTRO = """\
The other regime: the data arrives once, in order, and the model predicts each observation before it learns from
it (prequential, or test-then-train, evaluation). Each run reads its stream once with `carry_hidden=True`, Adam and
gradient clipping at norm 1, two runs at once on the two cores, one thread each. A window's targets are scored
by its forward pass, with the weights of the last optimizer step, before its own backward pass and step: its
mean loss at `WINDOW_COMPLETED` is their prequential loss, and each target is scored once. Quality is the mean
prequential loss over the whole stream and over its last quarter (of targets); compute is the seconds the run
took and its optimizer steps. Learning rates as in the budget study: per truncation, the rate of the grid
whose seed-0 run has the lowest mean prequential loss; three fresh seeds at that rate are reported. A
difference is called clear only when the seeds' ranges do not overlap.

The truncations are the budget study's, and per-token updates, TBPTT(1, b), the online extreme: an optimizer step
at every step of the stream, each backpropagating b steps.
"""
