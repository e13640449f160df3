"""Metrics as pure functions over (prediction, reference) pairs, plus CIs and aggregation.

Modules: ``generative`` (F1/EM/BLEU/METEOR, modes medqaro|robust), ``corpus`` (sacrebleu
BLEU/chrF), ``mcq`` (extraction, accuracy, group mapping), ``bootstrap`` (cluster CIs),
``wordnet`` (offline WordNet/RoWordNet), ``aggregate`` (the `medray score` result).
Heavy libraries (nltk, sacrebleu) are imported by those modules, not here.
"""
