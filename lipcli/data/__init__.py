"""Data for training and evaluation (``lip train``, ``lip certify``, ``lip bench``): data-set
resolution from ``lip_datasets`` plugins, subsets, splits, loaders and samplers
(:mod:`lipcli.data.loaders`)."""
