"""Main rewards computed in the experience maker (group-level reward hooks), and what they share."""
