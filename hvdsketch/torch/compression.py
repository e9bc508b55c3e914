"""``hvdsketch.torch.Compression``: drop-in values for Horovod's ``compression=``."""
from hvdsketch.dropin import CompressionNamespace, DropInCompression


class Compression(CompressionNamespace):
    """Like ``horovod.torch.Compression``: ``Compression.none``, ``Compression.fp16``,
    ``Compression.sketch(**options)``, ``Compression.from_spec("sketch:error=0.5")``."""

    drop_in = DropInCompression
