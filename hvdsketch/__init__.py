"""hvdsketch: compressed gradient exchange for Horovod (PyTorch and TensorFlow).

``hvdsketch.torch`` and ``hvdsketch.tensorflow`` are the plugin a training script imports;
``hvdsketch.lab`` is the ``hvdsketch`` command, its workloads and benchmarks (``pip install
"hvdsketch[lab]"``). The version below is the package's only one: setup.cfg reads it.
"""
__version__ = "0.1.0"
