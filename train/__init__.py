"""The first stage of the build path: fine-tuning a ranker (training), the chit-chat recipe on the packaged MiniLM
(recipe) and the shipped pair set with its ranking metrics (pairs, data/). See README.md in this folder."""
