"""The package's log lines, as vLLM prints them: INFO and above on stderr, once per record, with the time
and the module. NANOVLLM_CONFIGURE_LOGGING=0 leaves logging to the application; NANOVLLM_LOGGING_LEVEL
sets the level (default INFO)."""
import logging
import os
import sys

FORMAT = "%(levelname)s %(asctime)s [%(module)s] %(message)s"


def configure_logging() -> None:
    """Give the 'nanovllm' logger a stderr handler (once). Records do not propagate to the root logger,
    so an application that configures logging itself does not print them twice."""
    if os.environ.get("NANOVLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    logger = logging.getLogger("nanovllm")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("NANOVLLM_LOGGING_LEVEL", "INFO").upper())
    logger.propagate = False
