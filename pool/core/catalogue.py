"""Current NVIDIA data-centre GPUs: memory as nvidia-smi reports it, dense BF16 tensor
TFLOPS from NVIDIA's data sheets (SXM parts), and MIG profiles from the MIG user guide."""

GPU_MODELS = [
    {"name": "A100-40GB", "architecture": "Ampere", "memory_mib": 40960, "bf16_tflops": "312.0",
     "mig_capable": True,
     "mig_profiles": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]},
    {"name": "A100-80GB", "architecture": "Ampere", "memory_mib": 81920, "bf16_tflops": "312.0",
     "mig_capable": True,
     "mig_profiles": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]},
    {"name": "H100-80GB", "architecture": "Hopper", "memory_mib": 81559, "bf16_tflops": "989.4",
     "mig_capable": True,
     "mig_profiles": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]},
    {"name": "H200-141GB", "architecture": "Hopper", "memory_mib": 143771, "bf16_tflops": "989.4",
     "mig_capable": True,
     "mig_profiles": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]},
    {"name": "B200-180GB", "architecture": "Blackwell", "memory_mib": 183359,
     "bf16_tflops": "2250.0", "mig_capable": True,
     "mig_profiles": ["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]},
    {"name": "L40S-48GB", "architecture": "Ada Lovelace", "memory_mib": 46068,
     "bf16_tflops": "362.1", "mig_capable": False, "mig_profiles": []},
]
