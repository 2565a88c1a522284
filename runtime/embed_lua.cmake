# Writes OUT: a C++ file with each Lua script of runtime/lua as a string constant, so the scripts
# ship in the library and stay plain files that producers in other languages can load too.
string(REPLACE "," ";" NAMES "${NAMES}")
set(body "// Generated from runtime/lua/*.lua by runtime/embed_lua.cmake. Do not edit.\n")
string(APPEND body "#include \"backend/lua_scripts.hpp\"\n\nnamespace jobrt::lua {\n")
foreach(name IN LISTS NAMES)
  file(READ "${DIR}/${name}.lua" text)
  string(APPEND body "const char* const ${name} = R\"lua(${text})lua\";\n")
endforeach()
string(APPEND body "}  // namespace jobrt::lua\n")
file(WRITE "${OUT}.tmp" "${body}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
