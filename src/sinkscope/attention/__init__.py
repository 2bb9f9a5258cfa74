"""The attention call itself, below the model and the statistics that both use it.

``split``: the model's cached attention call (``cached_attention``: FlashAttention-4's or
cuDNN's attention with its log-sum-exp on CUDA), and the plan that splits a call's keys so that the kernel fills
the GPU (``key_split``); ``merge_kernel``: the Triton kernel that merges the parts;
``settings``: which kernels a model runs (``KernelSettings``, config ``capture.kernels``);
``flash4``: FlashAttention-4's forward as the attention kernel where installed (config
``capture.attention_kernel``).
``biased``: attention with edited key frames (``edited_attention``: masked or biased per head
and key frame), exact, from the model's own call.
"""
