"""What lookahead needs from the machine it runs on: numba's kernels or their Python twins (`jit`), measurements
kept on disk between processes (`store`), and the CPU threads torch gets (`threads`)."""
