"""``hvdsketch.torch.Compression``: drop-in values for Horovod's ``compression=``."""
from hvdsketch.dropin import CompressionNamespace, PresetCompression


class Compression(CompressionNamespace):
    """Like ``horovod.torch.Compression``: ``Compression.none``, ``Compression.fp16``,
    ``Compression.sketch`` or ``Compression.sketch(**options)``, every other drop-in compressor by
    its name, ``Compression.from_spec("sketch:error=0.5,density=0.05")``; one object per flag."""

    drop_in = PresetCompression
    own = "hvdsketch.torch.DistributedOptimizer(optimizer, model.named_parameters(), compression=...)"
