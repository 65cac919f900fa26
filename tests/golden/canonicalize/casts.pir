// RUN: canonicalize
// cast to the same dtype goes; cast(cast x) skips the middle dtype when x converts to it
// losslessly (i32 -> i64, f16 -> f32), not otherwise (f32 -> f16 rounds, f32 -> i32
// truncates, i64 -> f32 rounds large integers).
graph @f(
    %a: f32[3],
    %i: i32[3],
    %h: f16[3],
    %l: i64[3]
) -> (f32[3], f32[3], f64[3], i32[3], f32[3], f32[3], i64[3]) {
  %0 = cast(%a) {dtype=f32} : f32[3]
  %1 = cast(%i) {dtype=i64} : i64[3]
  %2 = cast(%1) {dtype=f32} : f32[3]
  %3 = cast(%h) {dtype=f32} : f32[3]
  %4 = cast(%3) {dtype=f64} : f64[3]
  %5 = cast(%a) {dtype=f16} : f16[3]
  %6 = cast(%5) {dtype=f32} : f32[3]
  %7 = cast(%a) {dtype=i32} : i32[3]
  %8 = cast(%7) {dtype=f32} : f32[3]
  %9 = cast(%l) {dtype=f32} : f32[3]
  %10 = cast(%9) {dtype=i64} : i64[3]
  %11 = cast(%i) {dtype=f64} : f64[3]
  %12 = cast(%11) {dtype=i32} : i32[3]
  return %0, %2, %4, %12, %6, %8, %10
}
// EXPECT:
graph @f(
    %a: f32[3],
    %i: i32[3],
    %h: f16[3],
    %l: i64[3]
) -> (f32[3], f32[3], f64[3], i32[3], f32[3], f32[3], i64[3]) {
  %0 = cast(%i) {dtype=f32} : f32[3]
  %1 = cast(%h) {dtype=f64} : f64[3]
  %2 = cast(%a) {dtype=f16} : f16[3]
  %3 = cast(%2) {dtype=f32} : f32[3]
  %4 = cast(%a) {dtype=i32} : i32[3]
  %5 = cast(%4) {dtype=f32} : f32[3]
  %6 = cast(%l) {dtype=f32} : f32[3]
  %7 = cast(%6) {dtype=i64} : i64[3]
  return %a, %0, %1, %i, %3, %5, %7
}
