"""Runnable examples of ignite-tbptt."""
