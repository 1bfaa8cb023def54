"""``python -m fedbench`` = the ``fedbench`` command (``torchrun --nproc_per_node N -m fedbench ...``)."""

from .cli import main

main()
