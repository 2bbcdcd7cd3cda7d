"""Fixtures for the training tier: real TensorFlow processes on loopback. The prepared MNIST
(``mnist_data_dir``) is tests/conftest.py's, shared with the local tier."""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers sit beside this file; put it on sys.path whatever pytest's import mode is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
