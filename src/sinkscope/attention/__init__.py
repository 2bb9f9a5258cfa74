"""The attention call itself, below the model and the statistics that both use it.

``split``: cuDNN's attention with its log-sum-exp, and the plan that splits a call's keys
so that the kernel fills the GPU (``balanced_attention``, ``key_split``); ``merge_kernel``:
the Triton kernel that merges the parts.
"""
