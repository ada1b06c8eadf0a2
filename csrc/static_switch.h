// Runtime switches become template parameters (the flash-attention static_switch.h idiom):
//   ROWGROUPS_SWITCH(n_row_groups, CONST_NAME, [&] { launch<CONST_NAME>(...); });
#pragma once

#define ROWGROUPS_SWITCH(VALUE, CONST_NAME, ...) \
  [&] {                                           \
    if ((VALUE) <= 1) {                           \
      constexpr static int CONST_NAME = 1;        \
      return __VA_ARGS__();                       \
    } else if ((VALUE) <= 2) {                    \
      constexpr static int CONST_NAME = 2;        \
      return __VA_ARGS__();                       \
    } else {                                      \
      constexpr static int CONST_NAME = 4;        \
      return __VA_ARGS__();                       \
    }                                             \
  }()
