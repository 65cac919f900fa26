// RUN: canonicalize
// transpose(transpose x) composes the permutations (and vanishes when they cancel);
// reshape chains keep the last shape; no-op reshape, broadcast_to, slice and a one-input
// concat go away; a^T b^T becomes (b a)^T.
graph @f(
    %x: f32[2,3,4],
    %m: f32[5,3],
    %n: f32[4,5]
) -> (f32[4,2,3], f32[2,3,4], f32[24], f32[2,3,4], f32[2,3,4], f32[2,3,4], f32[2,3,4], f32[3,4]) {
  %0 = transpose(%x) {perm=[1, 2, 0]} : f32[3,4,2]
  %1 = transpose(%0) {perm=[1, 2, 0]} : f32[4,2,3]
  %2 = transpose(%1) {perm=[1, 2, 0]} : f32[2,3,4]
  %3 = transpose(%x) {perm=[0, 1, 2]} : f32[2,3,4]
  %4 = reshape(%x) {shape=[6, 4]} : f32[6,4]
  %5 = reshape(%4) {shape=[-1]} : f32[24]
  %6 = reshape(%x) {shape=[2, 3, 4]} : f32[2,3,4]
  %7 = broadcast_to(%6) {shape=[2, 3, 4]} : f32[2,3,4]
  %8 = slice(%7) {axis=1} : f32[2,3,4]
  %9 = concat(%8) {axis=0} : f32[2,3,4]
  %10 = transpose(%m) : f32[3,5]
  %11 = transpose(%n) : f32[5,4]
  %12 = matmul(%10, %11) : f32[3,4]
  return %1, %2, %5, %3, %9, %6, %8, %12
}
// EXPECT:
graph @f(
    %x: f32[2,3,4],
    %m: f32[5,3],
    %n: f32[4,5]
) -> (f32[4,2,3], f32[2,3,4], f32[24], f32[2,3,4], f32[2,3,4], f32[2,3,4], f32[2,3,4], f32[3,4]) {
  %0 = transpose(%x) {perm=[2, 0, 1]} : f32[4,2,3]
  %1 = reshape(%x) {shape=[24]} : f32[24]
  %2 = matmul(%n, %m) : f32[4,3]
  %3 = transpose(%2) {perm=[1, 0]} : f32[3,4]
  return %0, %x, %1, %x, %x, %x, %x, %3
}
