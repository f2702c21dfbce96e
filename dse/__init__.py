"""Design-space exploration: performance and resource models and the exhaustive search (Eq. 2)."""
