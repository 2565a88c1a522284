// A shared library without a jobrt entry point.
extern "C" int not_a_plugin() { return 1; }
