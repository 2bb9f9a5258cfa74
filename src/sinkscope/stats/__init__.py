"""Attention statistics: per call (``attention``, with the torch reference in
``reference``, the Triton kernels in ``kernels`` and ``reduction_kernels``, launched by
``launch``) and the derived summaries of the tables (``summaries``: head, layer and block statistics, head diagnostics).

``summaries`` needs only numpy and pandas; the call statistics need torch and load on
first use (``sinkscope.stats.attention_statistics``). May import the
base modules only.
"""

__all__ = ["attention_statistics", "check_frame_layout", "resolve_key_lengths", "triton_available"]


def __getattr__(name: str):
    # Explicit import (not importlib) keeps the code digest's import scan complete.
    if name in __all__:
        from sinkscope.stats import attention

        return getattr(attention, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
