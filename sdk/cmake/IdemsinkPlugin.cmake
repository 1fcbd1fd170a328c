# idemsink_add_plugin(<name> SOURCES <files...> [LINK <libraries...>])
#
# Builds an idemsink handler plugin: a MODULE library named <name>.so with
# only the ABI entry symbol exported, compiled as C++20 against idemsink::sdk.
function(idemsink_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINK" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "idemsink_add_plugin(${name}): SOURCES is required")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE idemsink::sdk ${ARG_LINK})
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
endfunction()
