from setuptools import Extension, setup

setup(ext_modules=[Extension("cachemon_native", ["cachemon_native.c"], extra_compile_args=["-O2"])])
