// Catch2 v2 test runner for the unit and model tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
