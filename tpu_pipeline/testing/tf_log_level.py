"""As quiet as the CLI: TF_CPP_MIN_LOG_LEVEL set when the plugin package loads, before TensorFlow starts.

TF reads it once, when it starts, so it must be set before TensorFlow is imported (a plugin module
is the earliest place). C++ INFO lines hidden, warnings and errors kept; a TF_CPP_MIN_LOG_LEVEL you
set yourself wins, and `USER_SET` remembers that for the plugin's silenced start-up.
"""
import os

USER_SET = "TF_CPP_MIN_LOG_LEVEL" in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
