"""The SimPy processes of one run: devices, verifiers, centralized servers, routers, arrivals,
the shared run context and :func:`simulate`. ``inputs`` loads scenarios and checks plug-in names."""
