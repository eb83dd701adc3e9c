"""What runs inside Triton's python stub: LPX's model code and engines. Keep it free of heavy imports."""
