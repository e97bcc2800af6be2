"""Built-in plugins, written as external plugins are: each is a package (``soc``, ``lln``,
``crc``, ``activations``, ``pooling``, ``lipconvnet``, ``datasets``, ``losses``) whose
``plugin`` module holds its ``lip_*`` hook implementations (returning the components' specs)
beside the modules that implement the components; the host registers each ``plugin`` module
exactly like a third-party plugin (:data:`lipcli.host.plugins.BUILTIN_PLUGINS`)."""
