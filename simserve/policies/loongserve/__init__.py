"""Policy `loongserve` (LoongServe, SOSP'24; policies.md §4): `config` holds its YAML
parameters, `engine` the elastic sequence-parallel instances and `build`."""
