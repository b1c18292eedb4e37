"""Sphinx configuration: ``python -m sphinx -W -b html docs docs/_build/html``."""

import ignite_tbptt

project = "ignite-tbptt"
author = "the ignite-tbptt developers"
release = ignite_tbptt.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Distributed", "notes_style"), ("Shapes", "notes_style")]
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]
html_theme = "furo"  # its search box is built in
html_title = f"ignite-tbptt {release}"
html_static_path = []
