# Checks that README.md shows examples/<name> verbatim: the ```cpp block that follows the line
# "<!-- example: NAME -->" must equal the file. Run as
#   cmake -DREADME=README.md -DEXAMPLE=examples/decode_step.cpp -DNAME=examples/decode_step.cpp -P readme_block.cmake
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
set(marker "<!-- example: ${NAME} -->\n```cpp\n")
string(FIND "${readme}" "${marker}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no block marked '<!-- example: ${NAME} -->' followed by ```cpp")
endif()
string(LENGTH "${marker}" marker_len)
math(EXPR start "${at} + ${marker_len}")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```\n" end)
string(SUBSTRING "${rest}" 0 ${end} block)
if(NOT block STREQUAL example)
  message(FATAL_ERROR "README.md's block for ${NAME} differs from the file: copy the file into the README")
endif()
message(STATUS "README.md shows ${NAME} verbatim")
