"""The built-in training augmentation policies ``crop-flip``, ``randaugment`` and
``color-jitter`` (plugin ``lipcli.augmentations``, its hook in :mod:`.plugin`; the transforms
in :mod:`.policies`)."""
