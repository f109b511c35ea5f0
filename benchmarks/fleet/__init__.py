"""The fleet model behind benchmarks/fleet_sim.py: one idea per file."""
