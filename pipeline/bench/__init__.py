"""Load generation, genai-perf-style metrics, reports and plots for a served repository."""
