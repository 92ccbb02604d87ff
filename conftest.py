"""Test-session settings shared by the tests and the docstring examples (pytest reads this first)."""

import logging

import structlog

# The library never configures logging; the test session does, as an application would:
# keep warnings and errors, drop the info-level lifecycle events from test output.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
