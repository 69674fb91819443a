"""The OpenCL launch dataset (LLMPerf section II): kernel corpus, argument selection,
execution settings, contained execution, and the `opencl` sweep -> `opencl_launches`."""
