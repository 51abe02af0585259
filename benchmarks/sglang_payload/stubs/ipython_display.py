# Stand-in for IPython.display: sglang.utils imports it for notebook rendering only.
class HTML(str):
    pass


def display(*objs, **kwargs):
    print(*objs)
