"""``hvdsketch.torch.Compression``: drop-in values for Horovod's ``compression=``."""
from hvdsketch.dropin import CompressionNamespace, PresetCompression


class Compression(CompressionNamespace):
    """Like ``horovod.torch.Compression``: ``Compression.none``, ``.fp16``, ``.sketch`` or ``.sketch(**options)``,
    every other drop-in compressor by its name, ``Compression.from_spec("sketch:error=0.5,density=0.05")``.

    Each use makes a new compression with its own steps and tensor states, so give each optimizer (a GAN's two)
    its own. Keep the object to read its :meth:`~hvdsketch.dropin.DropInCompression.report`.

    Example::

        compression = hvdsketch.torch.Compression.sketch(error=0.5)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        ...
        print(compression.report())
    """

    drop_in = PresetCompression
    one_per_flag = False
    own = "hvdsketch.torch.DistributedOptimizer(optimizer, model.named_parameters(), compression=...)"
