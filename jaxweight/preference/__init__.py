"""Reward learning from preference comparisons (imitation), vectorised."""
