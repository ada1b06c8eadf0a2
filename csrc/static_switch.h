// Runtime switches become template parameters (the flash-attention static_switch.h idiom):
//   ROWGROUPS_SWITCH(n_row_groups, RG, [&] { return launch<RG>(...); });
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

// Warps per 16-row group: 2 (BN 32, 2 stages) or 4 (BN 16, 3 stages); 8 = the wide layout
// (verify_wide.cuh: 8 warps share all rows of the block); 16 = its streaming variant "wide2"; 32 =
// wide2 with 16 warps.
#define COLWARPS_SWITCH(VALUE, CONST_NAME, ...) \
  [&] {                                          \
    if ((VALUE) == 2) {                          \
      constexpr static int CONST_NAME = 2;       \
      return __VA_ARGS__();                      \
    } else if ((VALUE) == 16) {                  \
      constexpr static int CONST_NAME = 16;      \
      return __VA_ARGS__();                      \
    } else if ((VALUE) == 32) {                  \
      constexpr static int CONST_NAME = 32;      \
      return __VA_ARGS__();                      \
    } else if ((VALUE) == 8) {                   \
      constexpr static int CONST_NAME = 8;       \
      return __VA_ARGS__();                      \
    } else {                                     \
      constexpr static int CONST_NAME = 4;       \
      return __VA_ARGS__();                      \
    }                                            \
  }()
