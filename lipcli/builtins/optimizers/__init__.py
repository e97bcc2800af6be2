"""The built-in optimisers ``sgd`` (the paper's), ``adamw`` and ``nadam`` as components of
kind ``optimizer`` (plugin ``lipcli.optimizers``, its hook in :mod:`.plugin`); what they
compute is :func:`lipcli.train.optim.make_optimizer`, unchanged."""
