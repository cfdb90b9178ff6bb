import torch
from hwnas.supernet.checkpoint_io import load_checkpoint, save_checkpoint
from hwnas.supernet.recipes import TrainConfig
src = '/work/s43/cctsn200m.ckpt'
space, net, p = load_checkpoint(src)
ts = p['train_state']
extra = {'train_seconds': ts['seconds'], 'history': ts['history'],
         'stopped_at_step': ts['step'], 'total_steps': ts['total_steps'],
         'stopped_because': 'device time ran out; the remaining steps run at under 0.13 % of the peak learning rate'}
save_checkpoint('supernet/checkpoints/cct_cifar10.pt', net.float(), space, dataset=p['dataset'],
                train_config=TrainConfig.from_dict(p['train_config']), extra=extra, half=True,
                data_record=p['data_record'])
