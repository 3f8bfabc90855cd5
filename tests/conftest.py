"""Shared pytest setup. The package import installs the CPU shims before any openrlhf import in the tests."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import openrlhf_classmate  # noqa: E402,F401
