"""Stand-in for ``flash_attn`` on machines without CUDA (see ``openrlhf_classmate.shims``).

Only the helpers OpenRLHF imports at module level exist here, written in plain torch. There is deliberately no
``flash_attn_func``: code that needs the real kernels fails with a clear ImportError.
"""

__version__ = "0.0.0+openrlhf_classmate_shim"
__openrlhf_classmate_shim__ = True
