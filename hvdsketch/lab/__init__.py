"""The lab: real workloads, the ``hvdsketch`` command (``train``, ``plan``, ``bench``, ``info``) and
the benchmarks' plots. It is the package extra ``hvdsketch[lab]`` (PyYAML, tqdm, matplotlib,
mpi4py), which the README's commands install; the plugin (what a training script imports:
``hvdsketch.torch``, ``hvdsketch.tensorflow`` and what they use) never imports it."""
