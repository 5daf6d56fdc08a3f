"""The decode loop (`loop`), its fused fast path (`fused`), the sizing policies (`sizing`, `policy`, `calibrate`),
processors and stoppers (`processing`), outputs and settings."""
