import sys, dataclasses
sys.path.insert(0, 'benchmarks')
from hwnas.search import candidates
f = {x.name: x for x in dataclasses.fields(candidates.ScreeningConfig)}['reference_sd']
f.default = 0.0
candidates.ScreeningConfig.__init__.__defaults__  # noqa
import inspect
# rebuild the dataclass __init__ default
candidates.ScreeningConfig.__dataclass_fields__['reference_sd'].default = 0.0
sig_defaults = list(candidates.ScreeningConfig.__init__.__defaults__ or ())
names = [p for p in inspect.signature(candidates.ScreeningConfig.__init__).parameters][1:]
i = names.index('reference_sd') - (len(names) - len(sig_defaults))
sig_defaults[i] = 0.0
candidates.ScreeningConfig.__init__.__defaults__ = tuple(sig_defaults)
assert candidates.ScreeningConfig().reference_sd == 0.0
import search_joint
sys.exit(search_joint.main(sys.argv[1:]))
