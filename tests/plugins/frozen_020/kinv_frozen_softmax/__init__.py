"""A row-wise softmax as a kinv plugin, written against kinv 0.2.0's API (frozen: never edited)."""
