from vllm import VLLMNotInstalledError


class StatelessProcessGroup:
    @classmethod
    def create(cls, *args, **kwargs):
        raise VLLMNotInstalledError("StatelessProcessGroup.create (NCCL weight sync)")
