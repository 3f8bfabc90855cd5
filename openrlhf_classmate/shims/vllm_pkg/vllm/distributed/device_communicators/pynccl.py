from vllm import VLLMNotInstalledError


class PyNcclCommunicator:
    def __init__(self, *args, **kwargs):
        raise VLLMNotInstalledError("PyNcclCommunicator (NCCL weight sync)")
