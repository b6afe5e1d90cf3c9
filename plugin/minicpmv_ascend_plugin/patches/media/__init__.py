"""Media loading: refusals of bad images and URLs as 400s, image URLs from public addresses only."""
