"""Output of infiniband-diags read from ibsim under OpenSM: a fat tree of two leaves of two
hosts under two spines (fat_tree(4, 4, rate_gbps=100)), with `Unlink "leaf01"[3]` done (the
leaf01 - spine01 cable). Captured on Debian 13 (ibsim 0.10, infiniband-diags, OpenSM 3.3.23)."""

IBNETDISCOVER = """\
#
# Topology file: generated on Thu Dec  3 19:04:38 2026
#
# Initiated from node afae13cdc276c25b port afae13cdc276c25b

vendid=0x0
devid=0x0
sysimgguid=0xc2ddf5aea40842d
switchguid=0xc2ddf5aea40842d(c2ddf5aea40842d)
Switch	2 "S-0c2ddf5aea40842d"		# "spine01" base port 0 lid 3 lmc 0
[2]	"S-6f5dd3fad8775614"[3]		# "leaf02" lid 2 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0x6f5dd3fad8775614
switchguid=0x6f5dd3fad8775614(6f5dd3fad8775614)
Switch	4 "S-6f5dd3fad8775614"		# "leaf02" base port 0 lid 2 lmc 0
[1]	"H-7cb6f9e6ee9977d0"[1](7cb6f9e6ee9977d1) 		# "node03 mlx5_0" lid 7 4xEDR
[2]	"H-01cd736ca735dc6d"[1](1cd736ca735dc6e) 		# "node04 mlx5_0" lid 5 4xEDR
[3]	"S-0c2ddf5aea40842d"[2]		# "spine01" lid 3 4xEDR
[4]	"S-3b297347936cc9ab"[2]		# "spine02" lid 6 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0x3b297347936cc9ab
switchguid=0x3b297347936cc9ab(3b297347936cc9ab)
Switch	2 "S-3b297347936cc9ab"		# "spine02" base port 0 lid 6 lmc 0
[1]	"S-afae13cdc276c25b"[4]		# "leaf01" lid 1 4xEDR
[2]	"S-6f5dd3fad8775614"[4]		# "leaf02" lid 2 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0xafae13cdc276c25b
switchguid=0xafae13cdc276c25b(afae13cdc276c25b)
Switch	4 "S-afae13cdc276c25b"		# "leaf01" base port 0 lid 1 lmc 0
[1]	"H-edc768b3fcc6a141"[1](edc768b3fcc6a142) 		# "node01 mlx5_0" lid 4 4xEDR
[2]	"H-edb3ea8187ed02f5"[1](edb3ea8187ed02f6) 		# "node02 mlx5_0" lid 8 4xEDR
[4]	"S-3b297347936cc9ab"[1]		# "spine02" lid 6 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0x1cd736ca735dc6d
caguid=0x1cd736ca735dc6d
Ca	1 "H-01cd736ca735dc6d"		# "node04 mlx5_0"
[1](1cd736ca735dc6e) 	"S-6f5dd3fad8775614"[2]		# lid 5 lmc 0 "leaf02" lid 2 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0x7cb6f9e6ee9977d0
caguid=0x7cb6f9e6ee9977d0
Ca	1 "H-7cb6f9e6ee9977d0"		# "node03 mlx5_0"
[1](7cb6f9e6ee9977d1) 	"S-6f5dd3fad8775614"[1]		# lid 7 lmc 0 "leaf02" lid 2 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0xedb3ea8187ed02f5
caguid=0xedb3ea8187ed02f5
Ca	1 "H-edb3ea8187ed02f5"		# "node02 mlx5_0"
[1](edb3ea8187ed02f6) 	"S-afae13cdc276c25b"[2]		# lid 8 lmc 0 "leaf01" lid 1 4xEDR

vendid=0x0
devid=0x0
sysimgguid=0xedc768b3fcc6a141
caguid=0xedc768b3fcc6a141
Ca	1 "H-edc768b3fcc6a141"		# "node01 mlx5_0"
[1](edc768b3fcc6a142) 	"S-afae13cdc276c25b"[1]		# lid 4 lmc 0 "leaf01" lid 1 4xEDR
"""

PERFQUERY = """\
# Port counters: Lid 1 port 1 (CapMask: 0x1300)
PortSelect:......................1
CounterSelect:...................0x0000
SymbolErrorCounter:..............0
LinkErrorRecoveryCounter:........0
LinkDownedCounter:...............0
PortRcvErrors:...................0
PortRcvRemotePhysicalErrors:.....0
PortRcvSwitchRelayErrors:........0
PortXmitDiscards:................0
PortXmitConstraintErrors:........0
PortRcvConstraintErrors:.........0
CounterSelect2:..................0x00
LocalLinkIntegrityErrors:........0
ExcessiveBufferOverrunErrors:....0
QP1Dropped:......................0
VL15Dropped:.....................0
PortXmitData:....................1296
PortRcvData:.....................1296
PortXmitPkts:....................18
PortRcvPkts:.....................18
PortXmitWait:....................0
# Port counters: Lid 1 port 3 (CapMask: 0x1300)
PortSelect:......................3
CounterSelect:...................0x0000
SymbolErrorCounter:..............0
LinkErrorRecoveryCounter:........0
LinkDownedCounter:...............0
PortRcvErrors:...................0
PortRcvRemotePhysicalErrors:.....0
PortRcvSwitchRelayErrors:........0
PortXmitDiscards:................0
PortXmitConstraintErrors:........0
PortRcvConstraintErrors:.........0
CounterSelect2:..................0x00
LocalLinkIntegrityErrors:........0
ExcessiveBufferOverrunErrors:....0
QP1Dropped:......................0
VL15Dropped:.....................0
PortXmitData:....................5400
PortRcvData:.....................5400
PortXmitPkts:....................75
PortRcvPkts:.....................75
PortXmitWait:....................0
"""

PERFQUERY_EXTENDED = """\
# Port extended counters: Lid 1 port 1 (CapMask: 0x1300 CapMask2: 0x0000000)
PortSelect:......................1
CounterSelect:...................0x0000
PortXmitData:....................1296
PortRcvData:.....................1296
PortXmitPkts:....................18
PortRcvPkts:.....................18
PortUnicastXmitPkts:.............0
PortUnicastRcvPkts:..............0
PortMulticastXmitPkts:...........0
PortMulticastRcvPkts:............0
# Port extended counters: Lid 1 port 3 (CapMask: 0x1300 CapMask2: 0x0000000)
PortSelect:......................3
CounterSelect:...................0x0000
PortXmitData:....................5400
PortRcvData:.....................5400
PortXmitPkts:....................75
PortRcvPkts:.....................75
PortUnicastXmitPkts:.............0
PortUnicastRcvPkts:..............0
PortMulticastXmitPkts:...........0
PortMulticastRcvPkts:............0
"""
