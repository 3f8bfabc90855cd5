"""Helpers of ``python -m openrlhf_classmate.cli.evaluate``: generation backends (``generation``) and the summary,
table and plots (``report``)."""
