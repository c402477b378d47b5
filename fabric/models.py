"""InfiniBand fabrics: switches, HCAs, ports, links and the locality levels they define."""
