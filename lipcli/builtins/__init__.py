"""Built-in plugins: each module implements components and returns their specs from
``lip_*`` hooks; the host registers them exactly like third-party plugins."""
