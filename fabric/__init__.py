"""InfiniBand fabrics: switches, HCAs, links and levels, their import from `ibnetdiscover` and
Slurm `topology.conf`, export and generators; the pure core (`fabric.core`) is the topology and
the locality vocabulary. It may import only `ibex`; every app above may import it."""
