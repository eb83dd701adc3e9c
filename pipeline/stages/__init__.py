"""Pipeline stages, one module per stage."""
