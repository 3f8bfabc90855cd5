"""Main rewards computed in the experience maker (group-level reward hooks: DARLING, VR-CLI), and what they share."""
